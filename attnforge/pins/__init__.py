"""Pins: are the versions and commits the recipes pin real and consistent upstream
(upstream.py, `invoke pins.check`), and which newer ones would a release channel serve
(update.py, `invoke pins.update`; quartz.py reads AMD's nightly qualification feed)."""
