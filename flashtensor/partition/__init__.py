"""Which loop nodes each kernel computes, and what crosses kernel boundaries."""
