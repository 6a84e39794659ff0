// Test support (filled in with the multi-process harness).
