from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError
from django.core.validators import validate_email

from console.core.errors import DomainError
from console.tenancy.services import create_organization_with_admin


class Command(BaseCommand):
    help = ("Create an organization and its owner; print a write-scoped API token as the last line. "
            "The owner is the existing user with that email, or a new one (its password is printed).")

    def add_arguments(self, parser):
        parser.add_argument("name", help="The organization's name (unique).")
        parser.add_argument("--admin-email", required=True, help="The owner's email (their username if new).")
        parser.add_argument("--admin-password", help="Set this password for the owner instead of a random one.")

    def handle(self, *args, name, admin_email, admin_password, **options):
        name = name.strip()
        if not name or len(name) > 100:
            raise CommandError("NAME must be 1 to 100 characters")
        try:
            validate_email(admin_email)
        except ValidationError:
            raise CommandError(f"--admin-email {admin_email!r} is not an email address") from None
        try:
            result = create_organization_with_admin(name, admin_email, password=admin_password)
        except DomainError as exc:
            raise CommandError(exc.detail) from None
        self.stdout.write(f"Created organization {result.organization.name!r} (id {result.organization.pk}, "
                          f"slug {result.organization.slug}).")
        if result.owner_created:
            shown = "as given" if admin_password else result.owner_password
            self.stdout.write(f"Created owner {admin_email} with password: {shown}")
        else:
            self.stdout.write(f"Owner: existing user {admin_email}.")
        self.stdout.write("Write-scoped API token (shown once):")
        self.stdout.write(result.token)
