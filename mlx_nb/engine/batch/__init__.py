"""mlx_lm's BatchGenerator with our decode step, what may batch (from the measured compatibility
matrix, probed at load), and the private upstream names all of it relies on, checked in one place."""
