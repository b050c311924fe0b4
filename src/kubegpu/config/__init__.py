"""Versioned configuration model, file loading and flag > env > file > default precedence."""
