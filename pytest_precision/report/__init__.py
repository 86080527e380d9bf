"""Reports: a comparison's terminal summary and its JSON / CSV tables."""
