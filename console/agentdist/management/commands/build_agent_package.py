from django.core.management.base import BaseCommand, CommandError

from console.agentdist.build import Layout, PackageUnavailable, current_packages, download_wheels


class Command(BaseCommand):
    help = (
        "Build (or check) the agent package the installer downloads from /agent/. With --download, first "
        "fetch the pinned dependency wheels (requirements/agent-bundle.txt, and the clock-sync wheels of "
        "requirements/agent-native.txt for every target) with pip download: run that once "
        "when the console is set up or upgraded, with access to PyPI or a mirror. The console never uses the "
        "network at request time."
    )

    def add_arguments(self, parser):
        parser.add_argument("--download", action="store_true", help="pip download the pinned wheels first")
        parser.add_argument("--force", action="store_true", help="rebuild even when the cached build is current")

    def handle(self, *args, download, force, **options):
        layout = Layout.default()
        try:
            if download:
                wheels = download_wheels(layout)
                self.stdout.write(f"{len(wheels)} wheels in {layout.wheels_dir}")
            package, *variants = current_packages(layout, force=force)
        except PackageUnavailable as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(f"{package.path} {package.size} bytes\nsha256 {package.sha256}\nversion {package.version}")
        for variant in variants:
            self.stdout.write(f"{variant.target}: {variant.path} {variant.size} bytes sha256 {variant.sha256}")
