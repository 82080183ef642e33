//! Handle tables: CUDA handles are raw pointers to our objects, checked
//! against a table so a bad handle is `cudaErrorInvalidResourceHandle`
//! rather than a crash.

use std::{
    collections::HashMap,
    ffi::c_void,
    sync::{Arc, Mutex},
};

/// Live objects of one kind, keyed by the handle given to the caller.
pub struct Registry<T> {
    items: Mutex<HashMap<usize, Arc<T>>>,
}

impl<T> Registry<T> {
    pub fn new() -> Self {
        Self {
            items: Mutex::new(HashMap::new()),
        }
    }

    pub fn insert(&self, item: Arc<T>) -> *mut c_void {
        let h = Arc::as_ptr(&item) as usize;
        self.items
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(h, item);
        h as *mut c_void
    }

    pub fn get(&self, h: *mut c_void) -> Option<Arc<T>> {
        self.items
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&(h as usize))
            .cloned()
    }

    pub fn remove(&self, h: *mut c_void) -> Option<Arc<T>> {
        self.items
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&(h as usize))
    }

    pub fn all(&self) -> Vec<Arc<T>> {
        self.items
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .cloned()
            .collect()
    }
}
