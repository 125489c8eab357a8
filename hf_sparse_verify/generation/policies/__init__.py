"""K policies: how many draft tokens the next step verifies (constant, heuristic, plain, Cascade's utility).
A profile-guided planner belongs here too."""
