"""Pure domain values shared by every role. Nothing here does I/O or imports an edge library."""
