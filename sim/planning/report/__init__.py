"""The plan report: plan.json rendered as Markdown and self-contained HTML, with its figures."""
