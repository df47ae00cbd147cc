"""stdlib"""
