"""The imperative shell around the fleet planner: read the fleet, plan, apply, under a lock."""
