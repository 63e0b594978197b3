"""edumirror: EduMirror, value-driven multi-agent simulation of educational social dynamics (arXiv 2606.07948)."""
