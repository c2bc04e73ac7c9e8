"""Code copied into every image (probe, rules) or build context (stage): standard library and in_image only."""
