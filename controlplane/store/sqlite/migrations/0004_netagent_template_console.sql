-- A template's kernel console (console= value, or 'none'). Serial by
-- default, so a netbooted machine's console is never silent.
ALTER TABLE templates ADD COLUMN console TEXT NOT NULL DEFAULT 'ttyS0';
