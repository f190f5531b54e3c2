"""Lightning callbacks (Jacobian determinants, invertibility, orthogonality, ...) live here."""

__all__: list[str] = []
