//! Simulated training jobs for testing slowrank without GPUs.
