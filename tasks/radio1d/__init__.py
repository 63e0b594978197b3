"""radio1d: RADIO1D, elastic 1D token representations by multi-teacher distillation (ICML 2026)."""
