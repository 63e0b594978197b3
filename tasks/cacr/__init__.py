"""cacr: candidate-aware causal reasoning for temporal answer grounding (Qi et al., ICML 2026), reconstructed."""
