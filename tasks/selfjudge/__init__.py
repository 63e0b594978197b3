"""selfjudge: SelfJudge, self-supervised judge verification for faster speculative decoding (arXiv 2510.02329)."""
