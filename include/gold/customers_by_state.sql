-- Customers per state with their average FICO score (burst_bank).
-- keys: state
-- sources: customers
SELECT state,
       COUNT(*)                    AS customers,
       ROUND(AVG(fico), 1)         AS avg_fico,
       MIN(registration_date)      AS first_registration
FROM customers
GROUP BY state
