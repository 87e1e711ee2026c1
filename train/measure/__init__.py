"""What a run measures about itself and what analyses it: step time, profiles, utilization, diagnose."""
