"""covip: Contextualized Visual Personalization in Vision-Language Models (Oh et al., ICML 2026, arXiv 2602.03454)."""
