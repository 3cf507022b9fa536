"""The tile schedule of one kernel: grid, loop, in-tile variables and how its reductions are carried."""
