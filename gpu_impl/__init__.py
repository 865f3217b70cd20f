"""gdncheck.gpu_impl"""
