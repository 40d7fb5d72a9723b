"""The fleet console's files (HTML, CSS, JavaScript), served by ``model_cdn.http._console``.

Plain files shipped as package data: nothing is built or fetched at run time.
"""
