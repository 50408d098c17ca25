"""The report: plan.json rendered as Markdown and self-contained HTML, and the figures of sweeps and
plans. It reads tables and plan.json only, so it stands below the sweeps and the plans."""
