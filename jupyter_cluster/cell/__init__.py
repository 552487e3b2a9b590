"""A ``%%parallel`` cell as a function: ``capture`` finds and packs the names it reads, ``function`` runs it per item."""
