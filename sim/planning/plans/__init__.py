"""Plans: each candidate's maximum sustainable rate, searched over steady-state probes, then sized."""
