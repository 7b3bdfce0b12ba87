"""Fleet domain: worker profiles, the GPU catalog, and the state the planner reads."""
