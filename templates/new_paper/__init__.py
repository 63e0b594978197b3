"""new_paper: <paper title> (template; see docs/adding_a_paper.md)."""
