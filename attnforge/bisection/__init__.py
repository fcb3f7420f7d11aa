"""`invoke bisect`: which pin broke a check. search.py is the pure binary search (selectors,
verdicts, the state file); probe.py reads candidates and builds and checks one pin."""
