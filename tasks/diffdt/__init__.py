"""diffdt: generative disease trajectories with SDoH tokens and geometric diffusion of brain networks
(Wei, Dan, Wu, ICML 2026, arXiv 2605.09771), reconstructed; see README.md."""
