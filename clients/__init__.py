"""Trainer-side client for healthsvc. Standard library only: importing it pulls in no FastAPI,
pandas or torch."""
