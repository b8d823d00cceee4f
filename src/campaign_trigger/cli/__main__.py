"""``python -m campaign_trigger.cli``: the ``campaign-trigger`` command."""

from campaign_trigger.cli import main

main()
