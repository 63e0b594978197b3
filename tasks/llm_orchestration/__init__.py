"""llm_orchestration: Training-Free Multimodal Large Language Model Orchestration (Xie et al., ICML 2026)."""
