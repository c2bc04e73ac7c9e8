"""What runs on or against a host: select, doctor, smoke."""
