"""``python -m cloud_hub --repo DIR --broker mqtt://HOST:PORT``: run one hub."""

from ._cli import main

if __name__ == "__main__":
    main()
