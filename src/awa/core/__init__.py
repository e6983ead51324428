"""Core: the rules, with no I/O.

Job states and the sets derived from them (`awa.core.states`), the error tree
(`awa.core.errors`), insert options (`awa.core.options`), the job and outcome
types (`awa.core.model`) and the callback signing contract and CEL rules.
Everything else imports from here; this package imports nothing of Awa's.
"""
