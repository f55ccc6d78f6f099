"""Front ends of other protocols, each a translator onto the DataPlane."""
