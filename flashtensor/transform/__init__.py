"""Graph rewrites: decomposition of composites, lowering to loop form, algebraic rewrites of the loop form."""
