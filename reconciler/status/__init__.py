"""status"""
