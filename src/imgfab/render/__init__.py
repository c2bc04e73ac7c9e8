"""Stack + Lock → build context and run artifacts (Dockerfile, run.sh, compose, k8s), CI, bake; the escaping filters."""
