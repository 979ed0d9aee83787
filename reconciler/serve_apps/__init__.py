"""serve_apps"""
