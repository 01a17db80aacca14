-- Placeholder on branch secret-rotation only: tern needs contiguous versions, and 017 belongs to
-- another branch of issue 19. Drop this file when merging (the other branch brings the real one).
SELECT 1;
