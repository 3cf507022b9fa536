"""The intermediate representations: the graph IR (graph.py), the loop form (loops.py), their ops and evaluators."""
