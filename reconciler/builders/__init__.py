"""builders"""
