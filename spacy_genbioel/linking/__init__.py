"""linking"""
