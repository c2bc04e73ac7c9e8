"""imgfab in-image probe (copied from the imgfab package that rendered this image)."""
