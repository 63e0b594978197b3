"""eig_rubric: EIG-selected personalized rubrics against dimension drift (ICML 2026; reconstructed)."""
