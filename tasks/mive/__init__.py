"""mive: MiVE, multiscale vision-language features for reference-guided video editing (arXiv 2605.14664)."""
