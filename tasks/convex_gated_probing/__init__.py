"""convex_gated_probing: Better Audio Transformer guided by Convex Gated Probing (ICML 2026, arXiv 2602.16305)."""
