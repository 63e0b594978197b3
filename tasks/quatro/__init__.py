"""quatro: QUATRO, query-adaptive trust-region policy optimisation (arXiv 2602.04620; reconstructed)."""
