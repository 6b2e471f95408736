from django.core.management.base import BaseCommand

from sentinel.demo import ensure_demo


class Command(BaseCommand):
    help = "Create (or reuse) the admin user, the demo tenant, mock-backed models, and a fresh demo key."

    def add_arguments(self, parser):
        parser.add_argument("--mock-url", help="Base URL of the mock provider (default: SENTINEL_MOCK_URL).")

    def handle(self, *args, mock_url=None, **options):
        demo = ensure_demo(mock_url)
        self.stdout.write(f"admin user: {demo.admin_username}")
        self.stdout.write(f"demo key:   {demo.key_secret}")
