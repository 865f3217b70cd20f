"""gdncheck.reports"""
