"""Protocol front ends: each translates one wire format onto the DataPlane."""
