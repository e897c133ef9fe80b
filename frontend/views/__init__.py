"""Server-rendered pages. Views parse and authorize, then call tenancy.services;
none writes a model itself."""
