"""gdncheck.conformance"""
